//! Progress values that always increase: [`next_progress`] and the rewrite of the session's GET
//! stream, where some servers send progress on an upgraded call's token.

use super::UpgradeState;
use crate::exchange::{GatewayError, McpReply, McpRequest};
use crate::layers::McpService;

use parking_lot::Mutex;
use serde_json::Value;
use std::sync::Arc;
use tower::ServiceExt;

/// The next progress value on a token whose last value is `last`: the upstream's own value when
/// it increases, otherwise a little more than the last (below `total` when there is one), so the
/// values a client sees always increase (2025-11-25 basic/utilities/progress).
pub(super) fn next_progress(
    last: &Mutex<Option<f64>>,
    wanted: Option<f64>,
    total: Option<f64>,
) -> f64 {
    let mut last = last.lock();
    let next = match (*last, wanted) {
        (None, Some(p)) => p,
        (None, None) => 0.0,
        (Some(l), Some(p)) if p > l => p,
        (Some(l), _) => match total {
            Some(t) if t > l => l + (t - l) / 100.0,
            _ => l + 1.0,
        },
    };
    *last = Some(next);
    next
}

/// The standalone GET stream: progress the upstream sends there on an upgraded call's token
/// (the TypeScript SDK does) keeps increasing together with the call's own stream.
pub(super) async fn get_stream<S: McpService>(
    state: Arc<UpgradeState>,
    inner: S,
    req: McpRequest,
) -> Result<McpReply, GatewayError> {
    let caller = req.ctx.caller();
    let mut reply = inner.oneshot(req).await?;
    reply.body = reply.body.map_messages(move |data| {
        if state.tokens.lock().is_empty()
            || !crate::mcp::needles::found(&crate::mcp::needles::PROGRESS, data.as_bytes())
        {
            return None;
        }
        let mut v = serde_json::from_str::<Value>(data).ok()?;
        let token = v.pointer("/params/progressToken").map(Value::to_string)?;
        let last = state.tokens.lock().get(&(caller.clone(), token)).cloned()?;
        let wanted = v.pointer("/params/progress").and_then(Value::as_f64);
        let total = v.pointer("/params/total").and_then(Value::as_f64);
        let value = next_progress(&last, wanted, total);
        (Some(value) != wanted).then(|| {
            v["params"]["progress"] = Value::from(value);
            v.to_string()
        })
    });
    Ok(reply)
}
