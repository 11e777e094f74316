//! The upgraded `tools/call`: the upgrade and the driver up to the task's `CreateTaskResult`.

use super::early::{client_stream, finish, read_to_answer, First};
use super::follower::Follower;
use super::requests::send_tasks_cancel;
use super::tool_cache::Watched;
use super::tools::tool_support;
use super::{UpgradeState, EARLY_LIMIT, RELAY_CAPACITY};
use crate::exchange::{
    CallKey, GatewayError, McpReply, McpRequest, Operation, ReplyBody, RequestContext,
};
use crate::jsonrpc::{self, Id, Message};
use crate::layers::extensions::{NeedsTask, SessionView};
use crate::layers::McpService;
use crate::mcp::capabilities::ClientCapabilities;
use crate::mcp::classify::Classified;
use crate::mcp::era::Era;
use crate::mcp::errors::McpError;
use crate::mcp::tools::TaskSupport;
use crate::metrics::UpgradeOutcome;
use crate::sse::Event;
use bytes::Bytes;
use http::StatusCode;
use parking_lot::Mutex;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tower::ServiceExt;

/// A `tools/call`: upgraded to a task when it is a plain call to a `required` tool (see the module
/// docs), otherwise passed on as it is.
pub(super) async fn tools_call<S: McpService>(
    state: Arc<UpgradeState>,
    inner: Watched<S>,
    mut req: McpRequest,
) -> Result<McpReply, GatewayError> {
    // taskgate's own requests for this call go down in the client's session.
    let inner = inner.on_behalf_of(req.extensions.get::<SessionView>());
    let upgraded = match upgrade(&state, &inner, &req).await {
        Some(u) => u,
        None => {
            // A 2026-07-28 upstream (bridged) names task-only tools only by answering `-32021`:
            // then the call is sent again as a task (the tool is remembered by `bridge`).
            let retry = req.clone();
            let reply = inner.clone().oneshot(req).await?;
            match needs_task(&state, &retry, reply).await {
                Ok(reply) => return Ok(reply),
                Err(u) => {
                    req = retry;
                    u
                }
            }
        }
    };
    let Upgrade {
        message,
        original_id,
        progress_token,
    } = upgraded;
    req.op = Operation::Post(message);
    req.extensions.insert(crate::layers::extensions::Upgraded);
    let ctx = req.ctx.clone();
    let client = req
        .extensions
        .get::<SessionView>()
        .map(|v| v.client)
        .unwrap_or_default();

    // The call is known as upgraded from now on: a notifications/cancelled for its id, even one
    // that arrives before the CreateTaskResult, becomes a tasks/cancel.
    let (cancel_tx, cancel_rx) = oneshot::channel();
    let key = ctx.call_key(&original_id);
    let call_token = state.register(&key, cancel_tx);
    // The upstream side runs on its own task: a client that goes away before the
    // CreateTaskResult still leaves a recorded task, handled by `on_client_disconnect`.
    let (first_tx, first_rx) = oneshot::channel();
    tokio::spawn(drive(
        Upgraded {
            state,
            inner,
            ctx,
            client,
            original_id: original_id.clone(),
            progress_token,
            key,
            call_token,
        },
        req,
        cancel_rx,
        first_tx,
    ));
    match first_rx.await {
        Ok(reply) => reply,
        Err(_) => Ok(McpReply::error(
            Era::Legacy,
            Some(&original_id),
            &McpError::UpgradeEnded,
        )),
    }
}

/// Events without data (SSE priming events) looked past for the first message of a stream.
const MAX_DATALESS_EVENTS: usize = 8;

/// How long, after an event without data, the next event is waited for before the stream is
/// relayed as it is (a server's `-32021` follows its priming event at once).
const PRIMING_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// `Ok(reply)` to pass on, or `Err(upgrade)` when the `bridge` below said, in the reply's
/// [`NeedsTask`] fact, that the 2026-07-28 server answered `-32021` naming the tasks extension
/// (SEP-2663: the tool only runs as a task), from an upstream whose session declares
/// `tasks.requests.tools.call` (the `bridge` adds it for 2026 task servers). The fact is filled
/// as the message passes the bridge: for a JSON body before the reply comes up; for a stream,
/// once its first event with data has been read here (past at most [`MAX_DATALESS_EVENTS`]
/// events without data), which is the only message that counts. A reply without the fact (no
/// bridge on the way) passes at once; the stream is relayed unchanged otherwise.
async fn needs_task(
    state: &UpgradeState,
    req: &McpRequest,
    mut reply: McpReply,
) -> Result<McpReply, Upgrade> {
    use futures_util::StreamExt;
    if !upstream_tasks_tools_call(req) {
        return Ok(reply);
    }
    let Some(NeedsTask(needs_task)) = reply.extensions.remove::<NeedsTask>() else {
        return Ok(reply);
    };
    match reply.body {
        ReplyBody::Json(_) => {}
        ReplyBody::Stream(mut events) => {
            // The first event with data (a priming event, SEP-1699, has none: rmcp sends one).
            // Past the first event, the next is waited for at most [`PRIMING_WAIT`]: a plain
            // long call whose stream opens with a priming event keeps its headers and that
            // event flowing to the client (found by review).
            let mut seen = Vec::new();
            loop {
                let next = if seen.is_empty() {
                    events.next().await
                } else {
                    match tokio::time::timeout(PRIMING_WAIT, events.next()).await {
                        Ok(next) => next,
                        Err(_) => break,
                    }
                };
                let Some(ev) = next else {
                    break;
                };
                let data = ev.data.as_ref().is_some_and(|d| !d.is_empty());
                seen.push(ev);
                if data || seen.len() >= MAX_DATALESS_EVENTS {
                    break;
                }
            }
            reply.body =
                ReplyBody::Stream(Box::pin(futures_util::stream::iter(seen).chain(events)));
        }
        other => reply.body = other,
    }
    if needs_task.get().is_none() {
        return Ok(reply);
    }
    match as_task(state, req) {
        Some(u) => {
            tracing::info!("tools/call answered -32021 (task only): sent again as a task");
            Err(u)
        }
        None => Ok(reply),
    }
}

/// Whether the upstream of `req`'s session declared `tasks.requests.tools.call` (the session
/// stage's [`SessionView`]; a session taskgate does not hold: no).
fn upstream_tasks_tools_call(req: &McpRequest) -> bool {
    req.extensions
        .get::<SessionView>()
        .is_some_and(|v| v.upstream_tasks_tools_call)
}

/// `req` (a plain `tools/call`) with `params.task = {ttl: upgrade.ttl_ms}`.
fn as_task(state: &UpgradeState, req: &McpRequest) -> Option<Upgrade> {
    let Operation::Post(msg) = &req.op else {
        return None;
    };
    let c = Classified::of(msg);
    if c.param("task").is_some() {
        return None;
    }
    Some(Upgrade {
        message: with_task(msg, state.config.ttl_ms)?,
        original_id: msg.id().cloned()?,
        progress_token: progress_token(&c),
    })
}

/// `msg` with `params.task = {"ttl": ttl_ms}` spliced in as `params`' first member: every
/// other byte goes upstream as the client sent it. `None` when `params` is not an object.
fn with_task(msg: &Message, ttl_ms: u64) -> Option<Message> {
    let params = msg.params().filter(|p| p.starts_with('{'))?;
    let member = format!("\"task\":{{\"ttl\":{ttl_ms}}}");
    let bytes = jsonrpc::splice::insert_first(msg.bytes(), params, &member)?;
    Message::parse(bytes).ok()
}

/// The client's `params._meta.progressToken`, as the edge classified it.
fn progress_token(c: &Classified<'_>) -> Option<Value> {
    serde_json::from_str(c.progress_token()?).ok()
}

/// A plain `tools/call` to a `required` tool, upgraded: the message with `params.task` added.
struct Upgrade {
    message: Message,
    original_id: Id,
    progress_token: Option<Value>,
}

/// The upgraded message when `req` is a plain `tools/call` to a `required` tool of an upstream
/// that runs `tools/call` as tasks; `None` when it is to be passed on as it is.
async fn upgrade<S: McpService>(
    state: &UpgradeState,
    inner: &S,
    req: &McpRequest,
) -> Option<Upgrade> {
    let Operation::Post(msg) = &req.op else {
        return None;
    };
    // Cheap checks first: most calls are not candidates and are not parsed again.
    let view = req.extensions.get::<SessionView>()?;
    if !view.upstream_tasks_tools_call {
        return None;
    }
    // As the edge classified it: no parse of the message.
    let c = Classified::of(msg);
    let plain = c.param("task").is_none();
    let tool = c.tool()?;
    if !plain
        || tool_support(state, inner, &req.ctx, view, &tool).await != Some(TaskSupport::Required)
    {
        return None;
    }
    let original_id = msg.id().cloned()?;
    let progress_token = progress_token(&c);
    let message = with_task(msg, state.config.ttl_ms)?;
    tracing::info!(
        tool = &*tool,
        "plain tools/call to a required tool: upgraded to a task"
    );
    Some(Upgrade {
        message,
        original_id,
        progress_token,
    })
}

/// One upgraded call, before its task exists.
struct Upgraded<S> {
    state: Arc<UpgradeState>,
    inner: S,
    ctx: RequestContext,
    /// What the client declared (none kept: nothing declared).
    client: ClientCapabilities,
    original_id: Id,
    progress_token: Option<Value>,
    key: CallKey,
    call_token: u64,
}

/// Sends the upgraded call, answers the client (`first`) with its stream or, when no task came
/// of it, with the upstream's answer, and follows the task. When a request to the client comes
/// before the answer (the `bridge` relaying input a 2026 upstream needs before the task exists,
/// MRTR), the client gets its stream at once (see [`read_to_answer`]).
async fn drive<S: McpService>(
    call: Upgraded<S>,
    req: McpRequest,
    cancel_rx: oneshot::Receiver<()>,
    first: First,
) {
    let reply = match call.inner.clone().oneshot(req).await {
        Ok(r) => r,
        Err(e) => {
            call.end(UpgradeOutcome::UpstreamError);
            let _ = first.send(Err(e));
            return;
        }
    };
    let status = reply.status;
    let session_id = reply.headers.get("mcp-session-id").cloned();
    let (tx, rx) = mpsc::channel::<Event>(RELAY_CAPACITY);
    let mut pending = Some((first, rx, session_id));
    let mut early = Vec::new();
    let mut overflowed = false;
    let answer = read_to_answer(
        reply,
        &call.original_id,
        &mut early,
        &mut overflowed,
        &mut pending,
        &tx,
    )
    .await;
    if overflowed {
        if let Some((first, ..)) = pending {
            return call.overflowed(answer.as_ref(), first).await;
        }
    }
    let Some(answer) = answer else {
        call.end(UpgradeOutcome::UpstreamError);
        let error = McpError::UpgradeUnanswered {
            upstream: call.ctx.upstream.to_string(),
        };
        let reply = McpReply::error(Era::Legacy, Some(&call.original_id), &error);
        return finish(pending, &tx, reply).await;
    };
    let Some(task) = answer
        .pointer("/result/task")
        .filter(|t| t.get("taskId").is_some())
    else {
        // Not a task after all (an error, or the call ran plainly): the answer as it came.
        call.end(UpgradeOutcome::NotATask);
        let mut reply = McpReply::local_json(Bytes::from(answer.to_string()));
        reply.status = if status.is_success() {
            StatusCode::OK
        } else {
            status
        };
        return finish(pending, &tx, reply).await;
    };
    let task_id = task
        .get("taskId")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let poll = poll_interval(&task);
    let created = task.get("status").and_then(Value::as_str).map(|s| {
        let message = task.get("statusMessage").and_then(Value::as_str);
        (s.to_string(), message.unwrap_or_default().to_string())
    });
    let follower = call.into_follower(task_id, poll, tx, created);
    if let Some((first, rx, session_id)) = pending {
        // If the client is gone, this drops the stream and the follower sees a disconnect.
        let _ = first.send(Ok(client_stream(rx, session_id)));
    }
    for ev in early {
        follower.relay_other(ev).await;
    }
    follower.run(cancel_rx).await;
}

impl<S: McpService> Upgraded<S> {
    /// The call ended before its task was followed: forgets it and counts `outcome`.
    fn end(&self, outcome: UpgradeOutcome) {
        self.state.forget(&self.key, self.call_token);
        self.state.count(&self.ctx.upstream, outcome);
    }

    /// More than [`EARLY_LIMIT`] messages came before the answer: ends the exchange with an
    /// error and cancels the task, if the answer names one.
    async fn overflowed(self, answer: Option<&Value>, first: First) {
        self.end(UpgradeOutcome::RelayOverflow);
        let task_id = answer
            .and_then(|a| a.pointer("/result/task/taskId"))
            .and_then(Value::as_str);
        let error = McpError::UpgradeTooChatty {
            upstream: self.ctx.upstream.to_string(),
            limit: EARLY_LIMIT,
            cancelled: task_id.is_some(),
        };
        let _ = first.send(Ok(McpReply::error(
            Era::Legacy,
            Some(&self.original_id),
            &error,
        )));
        if let Some(task_id) = task_id {
            send_tasks_cancel(&self.inner, &self.state, &self.ctx, task_id).await;
        }
    }

    /// The follower of the call's task `task_id`, writing to `tx`.
    fn into_follower(
        self,
        task_id: String,
        poll: Duration,
        tx: mpsc::Sender<Event>,
        created: Option<(String, String)>,
    ) -> Follower<S> {
        let Upgraded {
            state,
            inner,
            ctx,
            client,
            original_id,
            progress_token,
            key,
            call_token,
        } = self;
        let mut progress = Arc::new(Mutex::new(None));
        let token_key = progress_token.as_ref().map(|t| {
            let k = (ctx.caller(), t.to_string());
            // Two calls of callers that cannot be told apart may use one token: they share its
            // progress state (values still increase), neither replaces the other's.
            progress = state
                .tokens
                .lock()
                .entry(k.clone())
                .or_insert_with(|| progress.clone())
                .clone();
            k
        });
        Follower {
            state,
            inner: Arc::new(inner),
            ctx,
            client,
            task_id,
            original_id,
            progress_token,
            poll,
            tx,
            progress,
            key,
            call_token,
            token_key,
            created,
        }
    }
}

/// How often the follower polls a task: its `CreateTaskResult`'s `pollInterval` (1 s when
/// absent) within [`crate::mcp::task::MIN_POLL`]..[`crate::mcp::task::MAX_POLL`]: an
/// upstream's 2^64 ms would leave the task unwatched (issue 29 #18).
fn poll_interval(task: &Value) -> Duration {
    Duration::from_millis(
        task.get("pollInterval")
            .and_then(Value::as_u64)
            .unwrap_or(1000),
    )
    .clamp(crate::mcp::task::MIN_POLL, crate::mcp::task::MAX_POLL)
}

#[cfg(test)]
mod tests {
    use super::poll_interval;
    use serde_json::json;
    use std::time::Duration;

    #[test]
    fn the_upstreams_poll_interval_is_bounded() {
        let at = |v| poll_interval(&json!({ "pollInterval": v }));
        assert_eq!(at(json!(u64::MAX)), Duration::from_secs(5));
        assert_eq!(at(json!(0)), Duration::from_millis(100));
        assert_eq!(at(json!(750)), Duration::from_millis(750));
        assert_eq!(poll_interval(&json!({})), Duration::from_secs(1));
    }
}
