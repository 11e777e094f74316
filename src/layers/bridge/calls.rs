//! The bridged `initialize`, `tools/list` and `tools/call` (see the module docs of `bridge`).

use super::answer::read_to_answer;
use super::{
    ask_with, errors, failure_reply, legacy_reply, modern_request, tasks_bridged, BridgeState,
    UpstreamEra, MAX_EARLY_BYTES, MAX_EARLY_EVENTS, MAX_TASK_ONLY_TOOLS,
};
use super::{follow, sessionless, translate};
use crate::exchange::{GatewayError, McpReply, McpRequest, Operation, ReplyBody};
use crate::jsonrpc::{self, Id};
use crate::layers::extensions::{
    ClientDeclares, Fact, HeldSession, HoldSession, NeedsTask, PendingCreation, PlainAnswerIsTask,
    SessionsHeld, SynthesizedTask,
};
use crate::layers::relay::mrtr;
use crate::layers::McpService;
use crate::mcp::capabilities::CLIENT_CAPABILITIES_META;
use crate::mcp::era::{Era, MODERN_VERSION};
use crate::mcp::errors::McpError;
use crate::sse::{ByteString, Event, EventStream, ReadAhead};
use crate::store::Origin;
use bytes::Bytes;
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::sync::Arc;
use tower::ServiceExt;

pub(super) async fn initialize<S: McpService>(
    state: Arc<BridgeState>,
    inner: S,
    req: McpRequest,
) -> Result<McpReply, GatewayError> {
    let Some(id) = req.id().cloned() else {
        return inner.oneshot(req).await;
    };
    if req.extensions.get::<SessionsHeld>().is_some() {
        return Ok(hold_initialize(&state, &inner, &req).await);
    }
    let probe_with = req.clone();
    let mut reply = inner.clone().oneshot(req).await?;
    if sessionless::refused_without_answer(&reply) {
        if let Some(answered) = try_hold(&state, &inner, &probe_with).await {
            return Ok(answered);
        }
    }
    // The answer, JSON or the SSE event carrying it (FastMCP answers `initialize` with SSE);
    // the events before it are kept, bounded, and relayed in order.
    let (answer, mut before, rest) = match reply.body {
        ReplyBody::Json(bytes) => (bytes, Vec::new(), None),
        ReplyBody::Stream(mut events) => {
            let mut before = Vec::new();
            let mut early = ReadAhead::new(MAX_EARLY_EVENTS, MAX_EARLY_BYTES);
            let mut found = None;
            while let Some(ev) = events.next().await {
                if ev
                    .data
                    .as_deref()
                    .is_some_and(|d| jsonrpc::is_answer_to(d.as_bytes(), &id))
                {
                    found = Some(ev);
                    break;
                }
                if early.admits(&ev) {
                    before.push(ev);
                }
            }
            let Some(ev) = found else {
                reply.body = ReplyBody::Stream(Box::pin(futures_util::stream::iter(before)));
                return Ok(reply);
            };
            let data = ev
                .data
                .clone()
                .map(ByteString::into_bytes)
                .unwrap_or_default();
            before.push(ev);
            (data, before, Some(events))
        }
        other => {
            reply.body = other;
            return Ok(reply);
        }
    };
    if sessionless::is_refusal(&answer) {
        // An upstream without 2025 sessions: taskgate holds them (see `held`).
        if let Some(answered) = try_hold(&state, &inner, &probe_with).await {
            return Ok(answered);
        }
    }
    let rewritten = legacy_initialize(&state, &inner, &probe_with, &answer).await;
    let answer = rewritten.unwrap_or(answer);
    reply.body = match rest {
        None => ReplyBody::Json(answer),
        Some(rest) => {
            if let Some(last) = before.last_mut() {
                last.data = Some(String::from_utf8_lossy(&answer).into_owned().into());
            }
            ReplyBody::Stream(Box::pin(futures_util::stream::iter(before).chain(rest)))
        }
    };
    Ok(reply)
}

/// The upstream refused `initialize`: when it answers `server/discover`, taskgate holds 2025
/// sessions for it from now on, and `held_sessions` answers this `initialize` itself (the
/// reply carries [`HoldSession`]); `None` (nothing learned) when it does not.
async fn try_hold<S: McpService>(
    state: &Arc<BridgeState>,
    inner: &S,
    req: &McpRequest,
) -> Option<McpReply> {
    let discovered = discover(state, inner.clone(), req).await?;
    Some(hold_session(state, discovered))
}

/// A 2025 `initialize` of a client on an upstream whose sessions taskgate holds (see the module
/// docs): the [`HoldSession`] reply `held_sessions` answers from; `-32603` when the upstream
/// does not answer `server/discover`.
async fn hold_initialize<S: McpService>(
    state: &Arc<BridgeState>,
    inner: &S,
    req: &McpRequest,
) -> McpReply {
    match discover(state, inner.clone(), req).await {
        Some(discovered) => hold_session(state, discovered),
        None => McpReply::error(Era::Legacy, req.id(), &McpError::DiscoverUnanswered),
    }
}

/// The reply to a 2025 `initialize` that `held_sessions` answers itself: empty, carrying the
/// [`HoldSession`] fact (the `server/discover` result, and whether the upstream serves the
/// tasks extension, learned from it).
fn hold_session(state: &BridgeState, discovered: Value) -> McpReply {
    let mut reply = McpReply::accepted();
    reply.extensions.insert(HoldSession {
        discovered,
        modern_tasks: state.known() == Some(UpstreamEra::ModernTasks),
    });
    reply
}

/// The upstream's `server/discover` result (`None`: not asked, no answer within the deadline,
/// or an error); the upstream's era is learned from it (see `era`).
async fn discover<S: McpService>(
    state: &Arc<BridgeState>,
    inner: S,
    req: &McpRequest,
) -> Option<Value> {
    let super::era::Discovered::Answer(Some(answer)) = state.era.ask(inner, req, &state.ids).await
    else {
        return None;
    };
    answer.get("result").filter(|r| r.is_object()).cloned()
}

/// An `InitializeResult` with the 2025 `capabilities.tasks` added when the upstream serves the
/// 2026 tasks extension; `None` when it stays as it is. An answer that declares 2025
/// `capabilities.tasks` stays as it is and asks nothing: the upstream's 2025 sessions serve 2025
/// tasks themselves ([`BridgeState::saw_legacy_tasks`]). Otherwise the era is asked on the way
/// (taskgate's own `server/discover`, once per upstream: the result says nothing of it).
async fn legacy_initialize<S: McpService>(
    state: &Arc<BridgeState>,
    inner: &S,
    req: &McpRequest,
    answer: &[u8],
) -> Option<Bytes> {
    let mut v = serde_json::from_slice::<Value>(answer).ok()?;
    let result = v.get_mut("result").filter(|r| r.is_object())?;
    if result.pointer("/capabilities/tasks").is_some() {
        state.saw_legacy_tasks();
        return None;
    }
    if tasks_bridged(state, inner, req).await && translate::add_legacy_tasks_capability(result) {
        return Some(Bytes::from(v.to_string()));
    }
    None
}

pub(super) async fn tools_list<S: McpService>(
    state: Arc<BridgeState>,
    inner: S,
    req: McpRequest,
) -> Result<McpReply, GatewayError> {
    let reply = inner.clone().oneshot(req).await?;
    if state.known() != Some(UpstreamEra::ModernTasks) {
        return Ok(reply);
    }
    let st = state.clone();
    let mut reply = reply;
    reply.body = reply.body.map_messages(move |text| {
        let mut v: Value = serde_json::from_str(text).ok()?;
        let result = v.get_mut("result")?;
        translate::mark_task_support(result, &|name| st.is_task_only(name)).then(|| v.to_string())
    });
    Ok(reply)
}

/// A plain 2025 `tools/call`: passed on; a `-32021` naming the tasks extension marks the tool
/// task-only and fills the reply's [`NeedsTask`] fact (for `upgrade` above, which then sends the
/// call again as a task); 2026-only error codes are mapped for the 2025 client (see `errors`).
pub(super) async fn plain_call<S: McpService>(
    state: Arc<BridgeState>,
    inner: S,
    req: McpRequest,
) -> Result<McpReply, GatewayError> {
    let tool = tool_name(&req);
    // A held session's call goes upstream as a 2026-07-28 request (a revision date), whatever
    // version its client named: its answer is always mapped.
    let map_errors = req.extensions.get::<Arc<HeldSession>>().is_some()
        || errors::is_revision_or_none(req.ctx.protocol_version());
    let mut reply = inner.oneshot(req).await?;
    let st = state.clone();
    let needs_task = NeedsTask::default();
    reply.extensions.insert(needs_task.clone());
    reply.body = reply.body.map_messages(move |text| {
        if !text.contains("-32021") {
            return translate::legacy_notification(text);
        }
        let v: Value = serde_json::from_str(text).ok()?;
        if translate::is_missing_tasks_extension(v.get("error")?) {
            needs_task.0.set(());
            if let Some(t) = &tool {
                let mut set = st.task_only.lock();
                if set.len() < MAX_TASK_ONLY_TOOLS {
                    set.insert(t.clone());
                }
            }
        }
        None
    });
    Ok(if map_errors {
        errors::legacy_reply(reply)
    } else {
        reply
    })
}

/// A 2025 task-augmented `tools/call` (see the module docs).
pub(super) async fn task_call<S: McpService>(
    state: Arc<BridgeState>,
    inner: S,
    mut req: McpRequest,
) -> Result<McpReply, GatewayError> {
    if state.serves_legacy_tasks() || !tasks_bridged(&state, &inner, &req).await {
        return inner.oneshot(req).await;
    }
    let Some(id) = req.id().cloned() else {
        return inner.oneshot(req).await;
    };
    if let Some(p) = req.extensions.get_mut::<PendingCreation>() {
        let mut template = (*p.template).clone();
        template.era = Era::Modern;
        // A call `upgrade` turned into a task keeps its origin.
        if template.origin != Origin::Upgraded {
            template.origin = Origin::Bridged;
        }
        template.upstream_session = None;
        template.protocol_version = Some(MODERN_VERSION.to_string());
        p.template = Arc::new(template);
    }
    let params = message_params(&req);
    let tool = tool_name(&req);
    let mut params = translate::modern_params(params.as_ref());
    declare_session_capabilities(&req, &mut params);
    let mut out = modern_request(&req, &id, "tools/call", params, tool.as_deref());
    // A plain answer is a task already completed: `observe` records it and says so here.
    let plain = PlainAnswerIsTask::default();
    out.extensions.insert(plain.clone());
    let recorded = plain.recorded;
    let read = |reply| read_answer(reply, &id);
    let (answer, early, rest) = match ask_with(&state, inner.clone(), out.clone(), &id, read).await
    {
        Ok(read) => read,
        Err(e) => return Ok(failure_reply(&id, &e)),
    };
    if answer.as_ref().is_some_and(mrtr::is_input_required) {
        let first = answer.unwrap_or_default();
        // Input before the task exists: MRTR on the call (see `relay::mrtr`); the final answer is
        // answered as below.
        let exchange = mrtr::Exchange {
            relay: state.relay.clone(),
            client: state.client_of(&out),
            inner,
            out,
            client_id: id.clone(),
            send: |inner: S, out| inner.oneshot(out),
        };
        let (state, inner) = (state.clone(), exchange.inner.clone());
        let finish = move |answer, rest| async move {
            cancel_refused_creation(&state, &inner, &req, Some(&answer)).await;
            creation_reply(&id, Some(answer), Vec::new(), rest, &recorded)
        };
        return Ok(exchange.spawn(first, early, finish));
    }
    cancel_refused_creation(&state, &inner, &req, answer.as_ref()).await;
    Ok(creation_reply(&id, answer, early, rest, &recorded))
}

/// The taskId of the 2026 `CreateTaskResult` in `answer` when [`creation_reply`] refuses it as
/// malformed (a status none of the five, or none: see [`translate::has_task_status`]) and it
/// names one.
fn refused_creation(answer: Option<&Value>) -> Option<&str> {
    let result = answer?.get("result")?;
    if result.get("resultType").and_then(Value::as_str) != Some("task")
        || (translate::legacy_create_result(result).is_some() && translate::has_task_status(result))
    {
        return None;
    }
    result.get("taskId")?.as_str()
}

/// Cancels upstream the task of a creation refused as malformed ([`refused_creation`]) while
/// its record is live (`observe` recorded it as the answer passed): the 2025 client, answered
/// `-32603`, never learns its id, and the record would hold one of its owner's live-task slots
/// until its ttl (tester 3 F7). `req`: the client's call.
async fn cancel_refused_creation<S: McpService>(
    state: &Arc<BridgeState>,
    inner: &S,
    req: &McpRequest,
    answer: Option<&Value>,
) {
    let Some(task_id) = refused_creation(answer) else {
        return;
    };
    match state
        .registry
        .record_cached(&req.ctx.upstream, task_id)
        .await
    {
        Ok(Some(record)) if !record.status.is_terminal() => {
            let why = "the upstream's CreateTaskResult names no valid task status";
            follow::cancel_by_taskgate(state, inner, req, &record, why).await;
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(task_id, error = %e, "the task of a malformed CreateTaskResult could not be read; not cancelled");
        }
    }
}

/// The 2025 answer to a bridged task-augmented `tools/call` from the upstream's `answer` (the
/// `early` events before it, the `rest` of its stream): the nested `CreateTaskResult`, the
/// `completed` task `observe` `recorded` for a plain result, or the error.
fn creation_reply(
    id: &Id,
    answer: Option<Value>,
    early: Vec<Event>,
    rest: Option<EventStream>,
    recorded: &Fact<SynthesizedTask>,
) -> McpReply {
    let result = answer.as_ref().and_then(|a| a.get("result"));
    if let Some(r) = result.filter(|r| r.get("resultType").and_then(Value::as_str) == Some("task"))
    {
        if translate::legacy_create_result(r).is_none() || !translate::has_task_status(r) {
            // A CreateTaskResult without a string taskId and a valid status: nothing to stand
            // behind (its task is cancelled: `cancel_refused_creation`).
            return McpReply::error(Era::Legacy, Some(id), &McpError::MalformedCreateTaskResult);
        }
    }
    if let Some(task) = recorded.get() {
        // The server ran the call plainly; `observe` recorded it as a completed task.
        let task =
            json!({ "task": serde_json::to_value(task.record.to_task()).unwrap_or(Value::Null) });
        return McpReply::local_json(jsonrpc::result_response(id, &task.to_string()));
    }
    let created = result.and_then(translate::legacy_create_result);
    let reply = legacy_reply(id, answer, |result| {
        translate::legacy_create_result(result).unwrap_or_else(|| result.clone())
    });
    match (created, rest) {
        // The creation's own stream goes on after the answer: its notifications (a
        // `notifications/tasks` as `notifications/tasks/status`) follow the answer.
        (Some(_), Some(rest)) => legacy_stream(early, reply, rest),
        _ => reply,
    }
}

/// Declares, in a bridged task call's 2026 `_meta`, the client capabilities taskgate relays
/// input for (`elicitation`, `sampling`, `roots`) that the client's session declared, so the
/// upstream may ask for input (MRTR or `input_required`), as `held_sessions` handed them down
/// ([`ClientDeclares`]). A held session's own capabilities are added by `modern_request`.
fn declare_session_capabilities(req: &McpRequest, params: &mut Value) {
    if req.extensions.get::<Arc<HeldSession>>().is_some() {
        return;
    }
    let Some(declares) = req.extensions.get::<ClientDeclares>().copied() else {
        return;
    };
    let Some(caps) = params
        .pointer_mut(&format!(
            "/_meta/{}",
            CLIENT_CAPABILITIES_META
                .replace('~', "~0")
                .replace('/', "~1")
        ))
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    for name in ["elicitation", "sampling", "roots"] {
        if declares.has(&format!("/{name}")) {
            caps.entry(name).or_insert_with(|| json!({}));
        }
    }
}

/// Reads `reply` up to the message answering `id` ([`read_to_answer`]): the answer; the
/// notifications before it as a 2025 client gets them ([`translate::legacy_event`]; at most
/// [`MAX_EARLY_EVENTS`] and [`MAX_EARLY_BYTES`], later ones dropped); and, for an SSE answer,
/// the rest of the stream.
async fn read_answer(reply: McpReply, id: &Id) -> (Option<Value>, Vec<Event>, Option<EventStream>) {
    let mut early = Vec::new();
    let mut bound = ReadAhead::new(MAX_EARLY_EVENTS, MAX_EARLY_BYTES);
    let (answer, rest) = read_to_answer(reply, id, |ev| {
        if bound.admits(&ev) {
            early.extend(translate::legacy_event(ev));
        }
        std::future::ready(true)
    })
    .await;
    (answer, early, rest)
}

/// The 2025 answer `reply` (one JSON message) as an SSE stream: the `early` events, the
/// answer, then the 2025 form of the `rest` of the upstream's stream
/// ([`translate::legacy_event`]).
fn legacy_stream(early: Vec<Event>, reply: McpReply, rest: EventStream) -> McpReply {
    let answer = match reply.body {
        ReplyBody::Json(bytes) => Event::message(String::from_utf8_lossy(&bytes).into_owned()),
        _ => return reply,
    };
    let events = futures_util::stream::iter(early)
        .chain(futures_util::stream::once(async move { answer }))
        .chain(rest.filter_map(|ev| async move { translate::legacy_event(ev) }));
    let mut headers = http::HeaderMap::new();
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(
        http::header::CACHE_CONTROL,
        http::HeaderValue::from_static("no-cache"),
    );
    McpReply::new(
        http::StatusCode::OK,
        headers,
        ReplyBody::Stream(Box::pin(events)),
    )
}

/// `params` of a POSTed message, as a value: only `params` is read, where the edge's envelope
/// pass found it.
fn message_params(req: &McpRequest) -> Option<Value> {
    let Operation::Post(msg) = &req.op else {
        return None;
    };
    serde_json::from_str(msg.params()?).ok()
}

/// `params.name` of a `tools/call`, as the edge classified it (`mcp::classify`).
fn tool_name(req: &McpRequest) -> Option<String> {
    req.classified()?.tool().map(std::borrow::Cow::into_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(len: usize) -> Event {
        Event::message(format!(
            r#"{{"jsonrpc":"2.0","method":"notifications/message","params":{{"data":"{}"}}}}"#,
            "x".repeat(len)
        ))
    }

    /// The events kept before an answer are bounded in bytes as well as in number: 64 events
    /// of `limits.max_event_bytes` each used to be held per answer.
    #[tokio::test]
    async fn early_events_are_bounded_in_bytes() {
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let big = MAX_EARLY_BYTES / 2;
        for _ in 0..3 {
            tx.send(event(big)).await.unwrap();
        }
        tx.send(event(10)).await.unwrap();
        tx.send(Event::message(
            r#"{"jsonrpc":"2.0","id":1,"result":{}}"#.into(),
        ))
        .await
        .unwrap();
        drop(tx);
        let reply = McpReply::event_stream(rx, None);
        let id = Id::from_json("1").unwrap();
        let (answer, early, _) = read_answer(reply, &id).await;
        assert!(answer.is_some());
        let kept: usize = early
            .iter()
            .map(|e| e.data.as_deref().map_or(0, str::len))
            .sum();
        assert!(kept <= MAX_EARLY_BYTES, "{kept} bytes kept");
        assert_eq!(early.len(), 2, "one large event and the small one");
    }
}
