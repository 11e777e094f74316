//! The SERVER span of each MCP request the edge sends down the stack (issue 34; `telemetry`
//! says what is exported and when). Its parent comes from `params._meta.traceparent`, else the
//! HTTP `traceparent` (`telemetry::propagation::Incoming`); it travels down as the request's
//! `RequestTrace` (its `trace` field), on which the layers set `mcp.task.id` and task links and
//! the upstream client the upstream's address; it ends when the answer is complete (an SSE
//! answer: when its stream ends), carrying `error.type` for an error answer.

use crate::exchange::{McpRequest, Operation};
use crate::headers::{text, MCP_PROTOCOL_VERSION};
use crate::jsonrpc::Kind;
use crate::mcp::classify::Classified;
use crate::mcp::era::PROTOCOL_VERSION_META;
use crate::telemetry::propagation::{self, Incoming};
use crate::telemetry::{
    protocol_version, semconv, shared_json_name, RequestTrace, RequestValues, Target, Telemetry,
};
use http::{HeaderMap, HeaderName, HeaderValue};
use std::borrow::Cow;

/// Starts the SERVER span of `request` (a POSTed JSON-RPC request; GET streams, DELETEs,
/// notifications and responses get none) and sets it as the request's `trace`.
pub(super) fn start(telemetry: &Telemetry, request: &mut McpRequest) -> Option<RequestTrace> {
    let Operation::Post(msg) = &request.op else {
        return None;
    };
    if msg.kind() != Kind::Request {
        return None;
    }
    let c = Classified::of(msg);
    let method = c.method()?;
    // Compared with prebuilt names: by `&str`, each lookup parsed the name first (~180
    // instructions each, callgrind, issue 34); found by a look at each field present, not
    // hashed (~120 instructions less per look-up), all three in one look: a look per name
    // (`headers::find`) cost as much for two as this for three (~10 instructions more,
    // callgrind, issue 34), and the client's trace fields are taken out below, which needs to
    // know of its `tracestate` too.
    static TRACEPARENT: HeaderName = HeaderName::from_static(semconv::TRACEPARENT);
    static TRACESTATE: HeaderName = HeaderName::from_static(semconv::TRACESTATE);
    let Fields {
        traceparent,
        tracestate,
        version,
    } = Fields::of(&request.ctx.headers, &TRACEPARENT, &TRACESTATE);
    let meta = c
        .meta_str(semconv::TRACEPARENT)
        .and_then(|tp| propagation::parse(&tp, c.meta_str(semconv::TRACESTATE).as_deref()));
    let from_header = traceparent
        .and_then(text)
        .and_then(|tp| propagation::parse(tp, tracestate.and_then(text)));
    let incoming = Incoming::choose(meta, from_header);
    let client_fields = traceparent.is_some() || tracestate.is_some();

    // Made only for a span that is sampled (a span that is not carries only its context).
    let details = |values: &mut RequestValues| {
        // A string id without its quotes (decoded), a number as written; as bytes (UTF-8, an
        // `Id`'s), not checked again (`Id::as_json`'s check cost each SERVER span ~55
        // instructions, callgrind, issue 34).
        let id = msg.id().map(|id| {
            let json = id.as_bytes();
            let inner = json.strip_prefix(b"\"").and_then(|j| j.strip_suffix(b"\""));
            match inner {
                Some(inner) if !inner.contains(&b'\\') => Cow::Borrowed(inner),
                Some(_) => serde_json::from_slice::<String>(json)
                    .map_or(Cow::Borrowed(json), |s| Cow::Owned(s.into_bytes())),
                None => Cow::Borrowed(json),
            }
        });
        let version = match version.and_then(text) {
            Some(v) => Some(protocol_version(v)),
            None => c
                .meta_str(PROTOCOL_VERSION_META)
                .map(|v| protocol_version(&v)),
        };
        let session = request.ctx.client_session_id.as_ref().and_then(text);
        values.set(id.as_deref(), version, session);
        let attributes = match c.task_id() {
            Some(task_id) => vec![crate::telemetry::task_id_attribute(task_id)],
            None => Vec::new(),
        };
        // Its bytes compared with the names kept, not checked as UTF-8 first (issue 34).
        let name = || msg.param_bytes("name").and_then(shared_json_name);
        let target = match method {
            "tools/call" => name().map_or(Target::None, Target::Tool),
            "prompts/get" => name().map_or(Target::None, Target::Prompt),
            _ => Target::None,
        };
        (target, attributes)
    };
    let trace = telemetry.request_span(method, incoming, details);
    // The client's own trace fields, read, are taken out here, where they are known to be
    // there (a hashed removal each, for the few clients that send them): the upstream client
    // sets its own for a request with this span and need not look for the client's
    // (`upstream::traced`; the look cost each traced request ~60 instructions, callgrind,
    // issue 34).
    if client_fields {
        request.ctx.headers.remove(&TRACEPARENT);
        request.ctx.headers.remove(&TRACESTATE);
    }
    request.trace = Some(trace.clone());
    Some(trace)
}

/// The first values of the header fields a request's SERVER span reads: `traceparent`,
/// `tracestate` and `MCP-Protocol-Version`.
struct Fields<'a> {
    traceparent: Option<&'a HeaderValue>,
    tracestate: Option<&'a HeaderValue>,
    version: Option<&'a HeaderValue>,
}

impl<'a> Fields<'a> {
    /// The fields of `headers`, found in one look at each field present (`headers::find`'s
    /// look, for three names); `traceparent` and `tracestate` are those names, prebuilt.
    fn of(headers: &'a HeaderMap, traceparent: &HeaderName, tracestate: &HeaderName) -> Self {
        let mut fields = Fields {
            traceparent: None,
            tracestate: None,
            version: None,
        };
        for (name, value) in headers {
            let slot = if name == traceparent {
                &mut fields.traceparent
            } else if name == tracestate {
                &mut fields.tracestate
            } else if name == MCP_PROTOCOL_VERSION {
                &mut fields.version
            } else {
                continue;
            };
            slot.get_or_insert(value);
        }
        fields
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one look finds each of the three fields, the first value of each, whatever the
    /// order, and nothing for one absent (what a `headers::find` per name finds).
    #[test]
    fn the_span_fields_are_found_in_one_look() {
        static TRACEPARENT: HeaderName = HeaderName::from_static(semconv::TRACEPARENT);
        static TRACESTATE: HeaderName = HeaderName::from_static(semconv::TRACESTATE);
        let mut headers = HeaderMap::new();
        headers.insert(http::header::HOST, HeaderValue::from_static("h"));
        headers.append(
            "mcp-protocol-version",
            HeaderValue::from_static("2025-11-25"),
        );
        headers.append("tracestate", HeaderValue::from_static("a=1"));
        headers.append("tracestate", HeaderValue::from_static("b=2"));
        headers.append("traceparent", HeaderValue::from_static("tp-1"));
        headers.append("traceparent", HeaderValue::from_static("tp-2"));
        headers.insert("x-other", HeaderValue::from_static("o"));
        let f = Fields::of(&headers, &TRACEPARENT, &TRACESTATE);
        let find = |name: &HeaderName| crate::headers::find(&headers, name);
        assert_eq!(f.traceparent, find(&TRACEPARENT));
        assert_eq!(f.traceparent.map(HeaderValue::as_bytes), Some(&b"tp-1"[..]));
        assert_eq!(f.tracestate.map(HeaderValue::as_bytes), Some(&b"a=1"[..]));
        assert_eq!(f.version, find(&MCP_PROTOCOL_VERSION));
        assert!(f.version.is_some());
        let mut headers = HeaderMap::new();
        headers.insert(http::header::HOST, HeaderValue::from_static("h"));
        let f = Fields::of(&headers, &TRACEPARENT, &TRACESTATE);
        assert!(f.traceparent.is_none() && f.tracestate.is_none() && f.version.is_none());
    }

    /// A request's SERVER span takes its parent and trace state from the client's header
    /// fields, which are then taken out of the request (the upstream client sets its own and
    /// does not look for the client's in a request with a span); other fields stay.
    #[test]
    fn the_clients_trace_fields_are_read_then_taken_out() {
        let settings = crate::telemetry::Settings {
            traces_endpoint: "http://127.0.0.1:9/v1/traces".into(),
            service_name: "t".into(),
            sample_ratio: 1.0,
            headers: Vec::new(),
            timeout: std::time::Duration::from_millis(200),
            compression: crate::telemetry::Compression::None,
        };
        let counter = |n: &str| prometheus::IntCounter::new(n, n).unwrap();
        let telemetry = Telemetry::start(&settings, counter("f"), counter("d")).unwrap();
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        for (fields, want) in [
            (
                &[("traceparent", tp), ("tracestate", "k=v")][..],
                Some("k=v"),
            ),
            (&[("tracestate", "k=v")][..], None),
            (&[][..], None),
        ] {
            let mut request = crate::layers::testing::request(
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}"#,
            );
            for (name, value) in fields {
                request
                    .ctx
                    .headers
                    .insert(*name, HeaderValue::from_static(value));
            }
            request
                .ctx
                .headers
                .insert("x-other", HeaderValue::from_static("o"));
            let trace = start(&telemetry, &mut request).expect("a span");
            let parent = propagation::parse(tp, None).unwrap();
            assert_eq!(
                trace.context().trace_id() == parent.trace_id(),
                want.is_some(),
                "{fields:?}"
            );
            if let Some(state) = want {
                assert_eq!(trace.context().trace_state().header(), state);
            }
            let names: Vec<_> = request.ctx.headers.keys().map(|n| n.as_str()).collect();
            assert_eq!(names, ["x-other"], "{fields:?}");
            trace.end();
        }
        telemetry.shutdown();
    }
}
