//! Tools: `tools/list` shown to clients without `capabilities.tasks`, and a tool's `taskSupport`.

use super::early::{answer_of, Others};
use super::requests::internal_request;
use super::UpgradeState;
use crate::exchange::{GatewayError, McpReply, McpRequest, RequestContext};
use crate::layers::extensions::SessionView;
use crate::layers::McpService;
use crate::mcp::tools::TaskSupport;

use serde_json::Value;
use tower::ServiceExt;

/// Shows `required` tools as `optional` to clients without `capabilities.tasks`.
pub(super) async fn tools_list<S: McpService>(
    inner: S,
    req: McpRequest,
) -> Result<McpReply, GatewayError> {
    let view = req.extensions.get::<SessionView>().cloned();
    let mut reply = inner.oneshot(req).await?;
    let Some(view) = view else {
        return Ok(reply);
    };
    if view.client.tasks() || !view.upstream_tasks_tools_call {
        return Ok(reply);
    }
    reply.body = reply.body.map_messages(relax_required);
    Ok(reply)
}

/// `taskSupport: "required"` → `"optional"` in a `tools/list` result; `None` when nothing changes.
pub(super) fn relax_required(text: &str) -> Option<String> {
    if !crate::jsonrpc::contains(text.as_bytes(), b"\"required\"") {
        return None;
    }
    let mut v = serde_json::from_str::<Value>(text).ok()?;
    let mut changed = false;
    if let Some(tools) = v.pointer_mut("/result/tools").and_then(Value::as_array_mut) {
        for tool in tools {
            if let Some(ts) = tool.pointer_mut("/execution/taskSupport") {
                if ts == "required" {
                    *ts = Value::String("optional".into());
                    changed = true;
                }
            }
        }
    }
    changed.then(|| v.to_string())
}

/// The `taskSupport` of `tool` in the client's session (`view`), from the tool cache; a tool not
/// seen yet triggers one `tools/list`, every page, sent through `inner` (whose replies fill the
/// cache: `inner` carries the client's session). `None`: taskgate holds no such session, or the
/// upstream listed no such tool.
pub(super) async fn tool_support<S: McpService>(
    state: &UpgradeState,
    inner: &S,
    ctx: &RequestContext,
    view: &SessionView,
    tool: &str,
) -> Option<TaskSupport> {
    let session = &view.session;
    if let Some(ts) = state.tools.support(session, tool) {
        return Some(ts);
    }
    // Not seen yet: one tools/list, every page (the tool cache records what passes).
    let mut cursor: Option<String> = None;
    for _ in 0..100 {
        let id = state.next_id();
        let params = match &cursor {
            Some(c) => serde_json::json!({ "cursor": c }),
            None => serde_json::json!({}),
        };
        let reply = inner
            .clone()
            .oneshot(internal_request(ctx, &id, "tools/list", params))
            .await
            .ok()?;
        let answer = answer_of(reply, &id, Others::Discard).await?;
        cursor = answer
            .pointer("/result/nextCursor")
            .and_then(Value::as_str)
            .map(str::to_string);
        if cursor.is_none() {
            break;
        }
    }
    state.tools.support(session, tool)
}
