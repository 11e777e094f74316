//! `notifications/tasks/status` for gateway tasks on the client's GET stream (2025-11-25
//! tasks: status notifications are optional, "never rely on it"): a 2025-11-25 session whose
//! client declared `capabilities.tasks` gets, on each GET stream it opens, one notification (the
//! task's 2025 `Task`) per status change of a gateway task created on that session (working →
//! `input_required` → working, and the terminal status), merged into the upstream's own GET
//! stream. The `tasks/result` stream of a held call carries them too (see `input`).
//!
//! Bounds: one channel per session with an open GET stream (it goes when its last stream
//! closes and the next notification finds nobody listening), [`BACKLOG`] notifications each;
//! a stream that falls further behind misses the oldest (they are optional).

use super::GatewayTasksState;
use crate::exchange::{McpReply, McpRequest, ReplyBody};
use crate::layers::extensions::SessionView;
use crate::sse::Event;
use crate::store::TaskRecord;
use futures_util::StreamExt;
use serde_json::json;
use tokio::sync::broadcast;

/// Most notifications a GET stream may fall behind by before it misses the oldest.
pub const BACKLOG: usize = 64;

/// The key of `req`'s session: its client's `Mcp-Session-Id`.
pub(super) fn session_of(req: &McpRequest) -> Option<String> {
    req.ctx
        .client_session_id
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Whether `req` (a 2025-11-25 GET stream) is one to add notifications to: a session whose
/// client declared `capabilities.tasks`.
pub(super) fn listens(req: &McpRequest) -> Option<String> {
    let declared = req.extensions.get::<SessionView>()?.client;
    if !declared.has("/tasks") {
        return None;
    }
    session_of(req)
}

/// The upstream's GET stream `reply` with the notifications for `session` merged in (as it
/// came when it is no stream). It ends when the upstream's stream ends.
pub(super) fn merged(state: &GatewayTasksState, session: &str, mut reply: McpReply) -> McpReply {
    let ReplyBody::Stream(upstream) = std::mem::replace(&mut reply.body, ReplyBody::Empty) else {
        return reply;
    };
    let rx = state
        .listeners
        .lock()
        .entry(session.to_string())
        .or_insert_with(|| broadcast::channel(BACKLOG).0)
        .subscribe();
    let stream = futures_util::stream::unfold((upstream, rx), |(mut up, mut rx)| async move {
        loop {
            tokio::select! {
                ev = up.next() => return ev.map(|ev| (ev, (up, rx))),
                note = rx.recv() => match note {
                    Ok(ev) => return Some((ev, (up, rx))),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    // The sender went (never while the entry lives): the upstream's alone.
                    Err(broadcast::error::RecvError::Closed) => {
                        let ev = up.next().await?;
                        return Some((ev, (up, rx)));
                    }
                },
            }
        }
    });
    reply.body = ReplyBody::Stream(Box::pin(stream));
    reply
}

/// Sends `session`'s GET streams the task's status now (its 2025 `Task`, read from the
/// registry), when any listens.
pub(super) async fn publish(state: &GatewayTasksState, session: Option<&str>, task: &TaskRecord) {
    let Some(session) = session else {
        return;
    };
    let tx = {
        let mut listeners = state.listeners.lock();
        match listeners.get(session) {
            Some(tx) if tx.receiver_count() == 0 => {
                listeners.remove(session);
                return;
            }
            Some(tx) => tx.clone(),
            None => return,
        }
    };
    let now = state
        .registry
        .lookup(&task.upstream, &task.task_id, &task.owner)
        .await;
    let Some(record) = now else {
        return;
    };
    let note = json!({"jsonrpc": "2.0", "method": "notifications/tasks/status",
        "params": serde_json::to_value(record.to_task()).unwrap_or_default()});
    let _ = tx.send(Event::message(note.to_string()));
}
