//! The requests taskgate sends on its own for an upgraded call (`tools/list`, `tasks/get`,
//! `tasks/result`, `tasks/cancel`): built in the client's context, so the layers below authorise,
//! route, single-flight and observe them as the client's.

use super::early::{answer_of, Others};
use super::UpgradeState;
use crate::exchange::{McpRequest, Operation, RequestContext, RequestParts};
use crate::jsonrpc::{Id, Message};
use crate::layers::McpService;
use bytes::Bytes;
use serde_json::Value;
use tower::ServiceExt;

/// A request taskgate sends on its own (tasks/get, tasks/result, tasks/cancel, tools/list), in the
/// client's context so the `tasks` layer authorises and routes it as the client's.
pub(super) fn internal_request(
    ctx: &RequestContext,
    id: &Id,
    method: &str,
    params: Value,
) -> McpRequest {
    let body = serde_json::json!({"jsonrpc": "2.0", "method": method, "params": params});
    let mut text = body.to_string();
    // Splice the id in as raw JSON (keeps its type).
    text.insert_str(1, &format!("\"id\":{},", id.as_json()));
    let msg = Message::parse(Bytes::from(text)).expect("a well-formed request");
    McpRequest::from(RequestParts {
        op: Operation::Post(msg),
        ctx: ctx.clone(),
        extensions: http::Extensions::new(),
        trace: None,
    })
}

/// Sends one `tasks/cancel` for an upgraded task upstream, through the rest of the stack (so the
/// `cancel` layer single-flights and records it), and logs the answer.
pub(super) async fn send_tasks_cancel<S: McpService>(
    inner: &S,
    state: &UpgradeState,
    ctx: &RequestContext,
    task_id: &str,
) -> CancelSent {
    send_tasks_cancel_for(inner, state, ctx, task_id, None).await
}

/// What became of a `tasks/cancel` taskgate sent itself.
#[derive(Debug)]
pub(super) enum CancelSent {
    /// The cancel was answered with a result: the task is cancelled (or was already terminal).
    Cancelled,
    /// It was answered with a JSON-RPC error (taskgate's own, or the upstream's), or without
    /// an answer; the text says what.
    Refused(String),
}

/// [`send_tasks_cancel`], authorised as `owner` when given ([`OnBehalfOf`](crate::layers::extensions::OnBehalfOf): a task whose client
/// is gone). Logs what actually happened.
pub(super) async fn send_tasks_cancel_for<S: McpService>(
    inner: &S,
    state: &UpgradeState,
    ctx: &RequestContext,
    task_id: &str,
    owner: Option<&crate::store::Owner>,
) -> CancelSent {
    let id = state.next_id();
    let mut req = internal_request(
        ctx,
        &id,
        "tasks/cancel",
        serde_json::json!({ "taskId": task_id }),
    );
    if let Some(owner) = owner {
        req.extensions
            .insert(crate::layers::extensions::OnBehalfOf(owner.clone()));
    }
    let outcome = match inner.clone().oneshot(req).await {
        Ok(reply) => match answer_of(reply, &id, Others::Discard).await {
            Some(v) if v.get("result").is_some() => CancelSent::Cancelled,
            Some(v) => CancelSent::Refused(v.get("error").unwrap_or(&v).to_string()),
            None => CancelSent::Refused("no answer".into()),
        },
        Err(e) => CancelSent::Refused(e.to_string()),
    };
    match &outcome {
        CancelSent::Cancelled => tracing::info!(task_id, "upgraded task cancelled upstream"),
        CancelSent::Refused(why) => {
            tracing::warn!(task_id, error = %why, "an upgraded task's tasks/cancel was refused")
        }
    }
    outcome
}
