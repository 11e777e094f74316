//! The bridge's own exchanges with the upstream and their 2025 answers: reading the answer to
//! an id out of a reply ([`answer_of`], with the relay's `read_to_answer`), one bounded exchange
//! ([`ask`], [`ask_with`], bounded by the relay's `Relay::bounded`), and the 2025 replies made
//! from an answer or a failure.

use super::{errors, BridgeState, McpService};
use crate::exchange::{GatewayError, McpReply, McpRequest};
use crate::jsonrpc::{self, Id};
pub(super) use crate::layers::relay::read_to_answer;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use bytes::Bytes;
use serde_json::Value;
use std::future::Future;
use tower::ServiceExt;

/// The answer to `id` in `reply` (a JSON body, or the event of an SSE body that answers it; the
/// stream's other messages are dropped). `None` when there is none (an HTTP error page, a
/// stream that ended first, a body that is not JSON).
pub(super) async fn answer_of(reply: McpReply, id: &Id) -> Option<Value> {
    read_to_answer(reply, id, |_| std::future::ready(true))
        .await
        .0
}

/// Sends taskgate's own request `out` (under `id`) upstream and reads the answer to `id` (see
/// [`answer_of`]). The whole exchange, an SSE stream's answer event included, is bounded by the
/// upstream's `timeout_ms` (`Relay::bounded`): past it the error is the upstream timeout's
/// ([`GatewayError::UpstreamTimeout`], "upstream `x` did not answer within N ms", counted in
/// `taskgate_upstream_errors_total{kind="timeout"}`), which the bridge answers as JSON-RPC
/// `-32603` (HTTP 200) like any error reaching the upstream.
pub(super) async fn ask<S: McpService>(
    state: &BridgeState,
    inner: S,
    out: McpRequest,
    id: &Id,
) -> Result<Option<Value>, GatewayError> {
    ask_with(state, inner, out, id, |reply| answer_of(reply, id)).await
}

/// [`ask`] for one of several exchanges bounded together by `deadline` (see
/// `Relay::bounded_until`): past it, the upstream timeout's error.
pub(super) async fn ask_until<S: McpService>(
    state: &BridgeState,
    inner: S,
    out: McpRequest,
    id: &Id,
    deadline: tokio::time::Instant,
) -> Result<Option<Value>, GatewayError> {
    let upstream = out.ctx.upstream.clone();
    let exchange = async {
        let reply = inner.oneshot(out).await?;
        Ok(answer_of(reply, id).await)
    };
    state
        .relay
        .bounded_until(upstream, id, deadline, exchange)
        .await
}

/// [`ask`] with the reply read by `read` (which may keep the rest of an SSE stream): the
/// exchange until `read` is done is bounded by the upstream's `timeout_ms`.
pub(super) async fn ask_with<S, T, F, Fut>(
    state: &BridgeState,
    inner: S,
    out: McpRequest,
    id: &Id,
    read: F,
) -> Result<T, GatewayError>
where
    S: McpService,
    F: FnOnce(McpReply) -> Fut,
    Fut: Future<Output = T>,
{
    let upstream = out.ctx.upstream.clone();
    let exchange = async {
        let reply = inner.oneshot(out).await?;
        Ok(read(reply).await)
    };
    state.relay.bounded(upstream, id, exchange).await
}

/// The 2025 answer under `id` when taskgate's own exchange with the upstream failed (see
/// [`ask`]): JSON-RPC `-32603` (HTTP 200) with the error's message.
pub(super) fn failure_reply(id: &Id, e: &GatewayError) -> McpReply {
    let error = McpError::Upstream {
        detail: e.to_string(),
    };
    McpReply::error(Era::Legacy, Some(id), &error)
}

/// The 2025 answer under `id` for an upstream `answer`: its `result` mapped by `map`, its
/// `error` as it is, or `-32603` when the upstream gave no answer. Always HTTP 200 JSON.
pub(super) fn legacy_reply(
    id: &Id,
    answer: Option<Value>,
    map: impl FnOnce(&Value) -> Value,
) -> McpReply {
    let Some(answer) = answer else {
        let error = McpError::BridgedUnanswered {
            upstream_version: crate::mcp::era::MODERN_VERSION,
        };
        return McpReply::error(Era::Legacy, Some(id), &error);
    };
    if let Some(result) = answer.get("result") {
        return McpReply::local_json(jsonrpc::result_response(id, &map(result).to_string()));
    }
    error_reply(id, answer.get("error"))
}

/// A 2025 JSON-RPC error answer under `id` carrying the upstream's `error` object, a 2026-only
/// code mapped (see `errors`); `-32603` when it is not one.
pub(super) fn error_reply(id: &Id, error: Option<&Value>) -> McpReply {
    match error.filter(|e| e.get("code").is_some_and(Value::is_i64)) {
        Some(e) => McpReply::local_json(Bytes::from(format!(
            r#"{{"jsonrpc":"2.0","id":{},"error":{}}}"#,
            id.as_json(),
            errors::legacy_error(e)
        ))),
        None => McpReply::error(
            Era::Legacy,
            Some(id),
            &McpError::BridgedNeitherResultNorError,
        ),
    }
}
