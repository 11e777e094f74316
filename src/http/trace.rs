//! The SERVER span of each MCP request the edge sends down the stack (issue 34; `telemetry`
//! says what is exported and when). Its parent comes from `params._meta.traceparent`, else the
//! HTTP `traceparent` (`telemetry::propagation::Incoming`); it travels down as the request's
//! `RequestTrace` (its `trace` field), on which the layers set `mcp.task.id` and task links and
//! the upstream client the upstream's address; it ends when the answer is complete (an SSE
//! answer: when its stream ends), carrying `error.type` for an error answer.

use crate::exchange::{McpRequest, Operation};
use crate::headers::{find, text, MCP_PROTOCOL_VERSION};
use crate::jsonrpc::Kind;
use crate::mcp::classify::Classified;
use crate::mcp::era::PROTOCOL_VERSION_META;
use crate::telemetry::propagation::{self, Incoming};
use crate::telemetry::{
    protocol_version, semconv, shared_json_name, KeyValue, RequestTrace, RequestValues, Target,
    Telemetry,
};
use http::HeaderName;
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
    // Looked up by prebuilt names: by `&str`, each lookup parsed the name first (~180
    // instructions each, callgrind, issue 34); found by a look at each field present
    // (`headers::find`), not hashed (~120 instructions less per look-up).
    static TRACEPARENT: HeaderName = HeaderName::from_static(semconv::TRACEPARENT);
    static TRACESTATE: HeaderName = HeaderName::from_static(semconv::TRACESTATE);
    let header = |name: &HeaderName| find(&request.ctx.headers, name).and_then(text);
    let meta = c
        .meta_str(semconv::TRACEPARENT)
        .and_then(|tp| propagation::parse(&tp, c.meta_str(semconv::TRACESTATE).as_deref()));
    let from_header =
        header(&TRACEPARENT).and_then(|tp| propagation::parse(tp, header(&TRACESTATE)));
    let incoming = Incoming::choose(meta, from_header);

    // Made only for a span that is sampled (a span that is not carries only its context).
    let details = |values: &mut RequestValues| {
        // A string id without its quotes (decoded), a number as written.
        let id = msg.id().map(|id| {
            let json = id.as_json();
            let inner = json.strip_prefix('"').and_then(|j| j.strip_suffix('"'));
            match inner {
                Some(inner) if !inner.contains('\\') => Cow::Borrowed(inner),
                Some(_) => {
                    serde_json::from_str::<String>(json).map_or(Cow::Borrowed(json), Cow::Owned)
                }
                None => Cow::Borrowed(json),
            }
        });
        let version = match find(&request.ctx.headers, &MCP_PROTOCOL_VERSION).and_then(text) {
            Some(v) => Some(protocol_version(v)),
            None => c
                .meta_str(PROTOCOL_VERSION_META)
                .map(|v| protocol_version(&v)),
        };
        let session = request.ctx.client_session_id.as_ref().and_then(text);
        values.set(id.as_deref(), version, session);
        let attributes = match c.task_id() {
            Some(task_id) => vec![KeyValue::new(semconv::MCP_TASK_ID, task_id.into_owned())],
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
    request.trace = Some(trace.clone());
    Some(trace)
}
