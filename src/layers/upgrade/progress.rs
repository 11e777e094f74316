//! Progress values that always increase: [`next_progress`] and the rewrite of the session's GET
//! stream, where some servers send progress on an upgraded call's token.

use super::UpgradeState;
use crate::exchange::{GatewayError, McpReply, McpRequest, ReplyBody};
use crate::layers::McpService;
use crate::store::Origin;
use futures_util::future::Either;

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

/// The task a message on a session's GET stream names when it is a `CreateTaskResult` or a
/// `notifications/tasks/status`: not the client's when that task was recorded as an upgraded
/// call's. A resumed GET stream (`Last-Event-ID`) gets what the upstream replays, and
/// server-everything replays every later event of the session, taskgate's own exchanges
/// included: the `CreateTaskResult` of an upgraded call, under the client's own id (the
/// TypeScript SDK resolved its `callTool` with it, an empty result, when taskgate restarted
/// during the call). And the status notifications of an upgraded call's task are taskgate's:
/// the client asked for no task, and gets the statuses as progress on its call's stream. (The
/// answers to taskgate's own requests are dropped below, by `ids`, with or without `upgrade`.)
/// Messages that cannot be either are not parsed.
fn upgraded_task_named(data: &str) -> Option<String> {
    use crate::mcp::needles::{may_name, TASK_KEY, TASK_STATUS};
    if !(may_name(&TASK_KEY, data.as_bytes()) || may_name(&TASK_STATUS, data.as_bytes())) {
        return None;
    }
    let v = serde_json::from_str::<Value>(data).ok()?;
    if let Some(method) = v.get("method") {
        let task_id = v.pointer("/params/taskId").and_then(Value::as_str);
        return match (method.as_str(), task_id) {
            (Some("notifications/tasks/status"), Some(t)) if v.get("id").is_none() => {
                Some(t.to_string())
            }
            _ => None,
        };
    }
    if v.get("result").is_none() {
        return None;
    }
    let task_id = v.pointer("/result/task/taskId")?.as_str()?;
    Some(task_id.to_string())
}

/// The standalone GET stream: progress the upstream sends there on an upgraded call's token
/// (the TypeScript SDK does) keeps increasing together with the call's own stream.
pub(super) async fn get_stream<S: McpService>(
    state: Arc<UpgradeState>,
    inner: S,
    req: McpRequest,
) -> Result<McpReply, GatewayError> {
    let caller = req.ctx.caller();
    let upstream = req.ctx.upstream.clone();
    let mut reply = inner.oneshot(req).await?;
    if let ReplyBody::Stream(events) = reply.body {
        use futures_util::StreamExt;
        let registry = state.registry.clone();
        reply.body = ReplyBody::Stream(Box::pin(events.filter(move |ev| {
            match ev.data.as_deref().and_then(upgraded_task_named) {
                None => Either::Left(std::future::ready(true)),
                Some(task_id) => {
                    let (registry, upstream) = (registry.clone(), upstream.clone());
                    Either::Right(Box::pin(async move {
                        let record = registry.record_cached(&upstream, &task_id).await;
                        !matches!(record, Ok(Some(r)) if r.origin == Origin::Upgraded)
                    }))
                }
            }
        })));
    }
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
